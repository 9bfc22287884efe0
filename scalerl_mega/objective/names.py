"""The objective's choice lists, torch-free so that config validation can import them without torch: the one
list of loss names (paper Sec. 3.2: CISPO, DAPO; GRPO, GSPO) and of loss aggregations (App. A.2)."""

LOSS_NAMES = ("cispo", "dapo", "grpo", "gspo")
"""The policy losses (`loss.name`, `losses.policy_loss(loss_type=...)`)."""
AGGREGATIONS = ("prompt", "sample", "token")
"""Loss aggregations (`loss.aggregation`)."""
