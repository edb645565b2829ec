"""HexStudio workers: processes that do the heavy work (export, quantize, validate, compile, simulate).

Each is `python -m hexstudio.workers.<stage> --spec spec.json` and speaks hexstudio.shared.protocol on stdout.
Nothing here imports Qt or the studio (hexstudio.core), so a worker runs on a remote Linux host too.
"""
