"""The agent: models (incl. the scripted model), tools, stop reasons, agent and graph building.

Knows nothing of HTTP or storage backends.
"""
