"""Personal folders: the owner's real folders, the copy tasks work on, keeping a task's changes
back into them, and the process that does it all as the folder's owner."""
