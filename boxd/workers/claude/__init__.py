"""The Claude Code worker: Anthropic's Claude Code CLI, headless, on the task's prompt."""
