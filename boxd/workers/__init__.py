"""Workers: the programs that do a task's work, each as the task's own user."""
