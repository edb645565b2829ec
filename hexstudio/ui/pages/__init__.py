"""The wizard pages, one per stage."""
