"""The studio's dialogs, one module each: the runs dashboard, a run's history, About."""
