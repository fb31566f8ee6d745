"""Volumes on the control plane: checks of a version's manifest (pure), the store (versions in ``ember_volumes``,
chunks in ``ember_volume_chunks``) and the collection of chunks no version uses."""
