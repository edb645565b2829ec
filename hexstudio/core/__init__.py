"""The Qt-free core: runs, stages, job runner, board, genie, reports, secrets, CLI."""
