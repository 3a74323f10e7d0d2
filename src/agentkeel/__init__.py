"""AgentKeel: owned, bounded, observable, recoverable runs for LangGraph agents."""

__version__ = "0.1.0"
