"""Genie on the board: transcript and profile parsers, KPIs, prompt templates, runs and the chat stage."""
