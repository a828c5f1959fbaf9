"""What a task is given on the machine: its user, its HOME, its network namespace, its disk quota,
its worker's transient unit and sandbox, and what the unit's end says (systemd, /proc, mounts)."""
