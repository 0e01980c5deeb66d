"""What requests, bytes and function time cost: AWS list prices, DynamoDB capacity, the usage each
function counts."""
