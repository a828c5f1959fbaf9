"""What the agents boxd installs itself (Droid, Claude Code) share: the installer of a pinned
binary (installer, `boxd droid-install` and `boxd claude-install`). Each agent's pin is in its
own package (boxd/droid/, boxd/claude/); the manager's view of the installs is
boxd/manager/agent_install.py."""
