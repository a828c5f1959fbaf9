"""The broker: one process per task, the task's only door to the box."""
