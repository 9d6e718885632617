"""The governed knowledge base."""
