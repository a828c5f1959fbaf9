"""boxd: a box where AI agents work for their owner, one Linux user and broker per task."""
