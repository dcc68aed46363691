"""titen-lambda: context compilation for AI agents (the product lives here)."""
