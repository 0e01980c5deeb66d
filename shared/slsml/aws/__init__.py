"""AWS access: boto3 clients with one retry policy, S3 objects written once and read by range, the warm cache."""
