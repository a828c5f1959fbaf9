"""What every boxd process sets before anything else imports: asyncio without ssl until someone
needs it (late_ssl), and pydantic's plugin loader one that finds none (pydantic_no_plugins).
boxd/__init__.py applies both. Nothing is imported here: a package's __init__ is loaded by every
import of its modules, by the broker too."""
