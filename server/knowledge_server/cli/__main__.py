"""`python -m knowledge_server.cli` = `knowledge`."""

from knowledge_server.cli import main

main()
