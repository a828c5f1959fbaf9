"""Workspaces: the folders in BOX_HOME/workspaces, each task's layer over them, and the review of
a layer's changes as a diff."""
