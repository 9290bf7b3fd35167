"""Pure math on tensors: advantage estimators, policy losses, KL estimators (registries)."""
