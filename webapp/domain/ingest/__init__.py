"""Events in: the v1 event contract, the rules that apply a batch, group commit."""
