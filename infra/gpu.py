"""The GPU worker's fleet (``functions.worker.accelerator_gib``): a Lambda Managed Instances capacity provider of GPU
instances in a VPC of its own with no route out (isolated subnets in ``deployment.ENDPOINT_AZS`` zones, no NAT), the
gateway and interface endpoints of the AWS services the worker calls (``deployment.GATEWAY_ENDPOINTS``,
``INTERFACE_ENDPOINTS``), and the attachment of the worker to it: its GPU memory per execution environment
(AcceleratorConfig, which aws-cdk-lib 2.275 does not model: a property override), one request per execution
environment, and no execution environment until a run asks for them (``slsml.aws.fleet``).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, RemovalPolicy, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra.layers import ARCHITECTURE
from slsml.spec import deployment
from slsml.spec.deployment import FunctionSettings

OPERATOR_POLICY = "AWSLambdaManagedEC2ResourceOperator"  # AWS's policy for a capacity provider's operator role
HTTPS = ec2.Port.tcp(443)
# the capacity provider's bound on MaxVCpuCount as aws-cdk-lib checks it
MIN_VCPU_COUNT = 12
# the finding of aws-cdk-lib's synth-time schema check on a property its schemas lack
UNKNOWN_PROPERTY = "CloudFormation-Validate::F3002"


def max_vcpus(worker: FunctionSettings) -> int:
    """The capacity provider's MaxVCpuCount: room for the fleet's most execution environments, one instance each of
    the largest allowed type (at most one environment per instance: how Lambda places environments on a GPU
    instance is not documented, so the cap never binds before ``max_environments`` does)."""
    assert worker.max_environments is not None
    largest = max(deployment.GPU_INSTANCES[t].vcpus for t in worker.instance_types)
    return max(MIN_VCPU_COUNT, worker.max_environments * largest)


class GpuFleet(Construct):
    """The VPC, its endpoints and the capacity provider a GPU worker runs on."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        worker: FunctionSettings,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self._worker = worker
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=deployment.ENDPOINT_AZS,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Fleet", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=20)
            ],
        )
        subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=removal_policy)
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
        # the instances accept no connection; they reach the endpoints and the gateways' prefix lists over HTTPS
        self.instances = ec2.SecurityGroup(
            self,
            "Instances",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="slsml GPU workers: HTTPS to the VPC endpoints and gateways, no inbound",
        )
        self.instances.add_egress_rule(
            ec2.Peer.any_ipv4(), HTTPS, "AWS services through the endpoints (the VPC has no route out)"
        )
        endpoints = ec2.SecurityGroup(
            self,
            "Endpoints",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="slsml interface endpoints: HTTPS from the GPU workers",
        )
        endpoints.add_ingress_rule(self.instances, HTTPS, "the GPU workers")
        for service in deployment.GATEWAY_ENDPOINTS:
            self.vpc.add_gateway_endpoint(
                f"{service.capitalize()}Gateway",
                service=ec2.GatewayVpcEndpointAwsService(service),
                subnets=[subnets],
            )
        for service in deployment.INTERFACE_ENDPOINTS:
            self.vpc.add_interface_endpoint(
                f"{service.capitalize()}Endpoint",
                service=ec2.InterfaceVpcEndpointAwsService(service),
                subnets=subnets,
                security_groups=[endpoints],
                open=False,
                private_dns_enabled=True,
            )
        operator = iam.Role(
            self,
            "OperatorRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="slsml GPU fleet: Lambda launches and manages the capacity provider's instances",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(OPERATOR_POLICY)],
        )
        NagSuppressions.add_resource_suppressions(
            operator,
            [
                NagPackSuppression(
                    id="AwsSolutions-IAM4",
                    reason=f"{OPERATOR_POLICY} is the policy AWS defines and maintains for a capacity provider's"
                    " operator role: the EC2 calls Lambda makes to run its managed instances, limited to instances"
                    " it manages by their ManagedResourceOperator condition.",
                    applies_to=[f"Policy::arn:<AWS::Partition>:iam::aws:policy/{OPERATOR_POLICY}"],
                )
            ],
        )
        self.capacity_provider = lambda_.CapacityProvider(
            self,
            "CapacityProvider",
            subnets=self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED).subnets,
            security_groups=[self.instances],
            operator_role=operator,
            architectures=[ARCHITECTURE],
            instance_type_filter=lambda_.InstanceTypeFilter.allow(
                [ec2.InstanceType(instance_type) for instance_type in worker.instance_types]
            ),
            # Auto, AWS's default made explicit: Lambda adds and removes instances itself, within MaxVCpuCount, for
            # the execution environments the function's scaling config asks for (Manual needs CPU target policies)
            scaling_options=lambda_.ScalingOptions.auto(),
            max_v_cpu_count=max_vcpus(worker),
        )

    def attach(self, function: lambda_.Function) -> None:
        """Run ``function`` on the fleet: one request per execution environment, each with a GPU of
        ``accelerator_gib``; published to $LATEST.PUBLISHED (what an unqualified invocation runs) with no execution
        environment (deactivated) until a run raises them (``slsml.aws.fleet``)."""
        self.capacity_provider.add_function(
            function,
            per_execution_environment_max_concurrency=1,
            execution_environment_memory_gib_per_v_cpu=deployment.GPU_MEMORY_GIB_PER_VCPU,
            publish_to_latest_published=True,
            # Min = Max = 0: the version deactivated (no environment, its instances ended) until a run's fleet sizer
            # asks for environments; 0 is within the range CloudFormation and PutFunctionScalingConfig document for
            # both (0 to 15,000), and AWS's guidance for Lambda Managed Instances names 0 and 0 as deactivation
            latest_published_scaling_config=lambda_.LatestPublishedScalingConfig(
                min_execution_environments=0, max_execution_environments=0
            ),
        )
        cfn = function.node.default_child
        assert isinstance(cfn, lambda_.CfnFunction)
        # aws-cdk-lib models AcceleratorConfig from 2.278 on; its synth-time schema check (CloudFormation Validate,
        # @aws-cdk/core:validateAgainstDefaultRules) does not know it yet. cfn-lint checks it, with the schema patch
        # in cfn-lint/ (.cfnlintrc).
        cfn.add_property_override("AcceleratorConfig", {"AcceleratorMemorySize": self._worker.accelerator_gib})
        Validations.of(cfn).acknowledge(
            Acknowledgment(
                id=UNKNOWN_PROPERTY,
                reason="AcceleratorConfig is a property of AWS::Lambda::Function (Lambda Managed Instances) that"
                " aws-cdk-lib 2.275's schemas lack; cfn-lint validates it against the patched schema",
            )
        )
