"""What the transforms share: the metrics namespace and the rejected-output tag."""

METRICS_NAMESPACE = "imagerecords"
REJECTED = "rejected"
# The shard writer's output of (content digest, (key, split, uri)) per written image.
CONTENTS = "contents"
# The shard writer's output of near.Item (perceptual hash, content digest, member) per hashed image.
NEAR = "near"
