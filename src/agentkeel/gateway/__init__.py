"""HTTP gateway (LangGraph Agent Server compatible). Built in a later issue."""
