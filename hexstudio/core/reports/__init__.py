"""Run reports (HTML, PDF, JSON) and run comparisons."""
