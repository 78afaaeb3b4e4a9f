"""The Long Range Arena's tasks, generated here: ListOps, Pathfinder and the byte-level text tasks."""
