"""The manager: the task state machine; the only part that changes a task's state."""
