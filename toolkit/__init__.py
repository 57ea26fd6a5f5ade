"""llm-compute-toolkit: plan large-model training and check the plan."""
