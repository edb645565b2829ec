"""Export of the deployment graphs: the prompt processor (AR-N) and the token generator (AR-1),
split into parts by layer range, with explicit KV-cache inputs and outputs (docs/CONTRACTS.md §2).

    from hexstudio.workers.export import export_deployment_graphs
    graphs = export_deployment_graphs(hf_dir, out_dir, context_length=512, ar_n=128, parts=2)

torch and transformers are imported inside the functions (hexstudio.core may import this package).
"""

from __future__ import annotations

from hexstudio.workers.export.graphs import (
    MASK_VALUE,
    export_deployment_graphs,
    graph_io_names,
    graph_name,
    load_hf_model,
)

__all__ = ["MASK_VALUE", "export_deployment_graphs", "graph_io_names", "graph_name", "load_hf_model"]
