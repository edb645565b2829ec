"""`hexstudio serve`: an OpenAI-compatible endpoint over a board's persistent dialog."""
