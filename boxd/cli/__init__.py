"""boxctl: the owner's command line for the box, over D-Bus."""
