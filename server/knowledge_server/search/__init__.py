"""The search coordinator (knowledge.search/v1): validation, routing, lanes, fusion, budget."""
