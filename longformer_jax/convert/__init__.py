"""Importing released checkpoints onto the project's modules (docs/import.md)."""
