"""The pinned Claude Code release and its installer (`boxd claude-install`)."""
