"""HexStudio workers: processes that do the heavy work (export, quantize, validate, compile, simulate).

Each is `python -m workers.<stage> --spec spec.json` and speaks workers.shared.protocol on stdout.
Nothing here imports Qt or the `app` package, so a worker runs on a remote Linux host too.
"""
