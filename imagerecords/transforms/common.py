"""What the transforms share: the metrics namespace and the rejected-output tag."""

METRICS_NAMESPACE = "imagerecords"
REJECTED = "rejected"
