"""A GPU worker (``functions.worker.accelerator_gib``): the stack runs it on a Lambda Managed Instances capacity
provider of GPU instances in a VPC with no route out but its endpoints, with the GPU memory asked per execution
environment and one request per environment; the functions that size its fleet may do that and no more. Without the
setting, the stack is the CPU stack: nothing of this is in it. A GPU worker's settings are checked as Lambda takes
them, and only the worker may have a GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk import App
from pydantic import ValidationError

from infra.compute import DOCKERFILE, GPU_DOCKERFILE
from infra.gpu import OPERATOR_POLICY
from infra.layers import ROOT
from infra.settings import Settings
from slsml.cli.main import main
from slsml.spec import deployment, wiring
from slsml.spec.limits import RunLimits

if TYPE_CHECKING:
    from conftest import Synthesized

GPU_ONLY_TYPES = {
    "AWS::Lambda::CapacityProvider",
    "AWS::EC2::VPC",
    "AWS::EC2::Subnet",
    "AWS::EC2::RouteTable",
    "AWS::EC2::SubnetRouteTableAssociation",
    "AWS::EC2::VPCEndpoint",
    "AWS::EC2::SecurityGroup",
    "AWS::EC2::SecurityGroupIngress",
    "AWS::EC2::FlowLog",
}


def of_type(synthesized: Synthesized, kind: str) -> dict[str, dict[str, Any]]:
    return {key: r for key, r in synthesized.resources.items() if r["Type"] == kind}


def function(synthesized: Synthesized, name: str) -> dict[str, Any]:
    props: dict[str, Any] = synthesized.resources[synthesized.logical_id(synthesized.stack.compute.functions[name])][
        "Properties"
    ]
    return props


def role_statements(synthesized: Synthesized, name: str) -> list[dict[str, Any]]:
    """The statements of the policies attached to function ``name``'s role."""
    role = synthesized.logical_id(synthesized.stack.compute.functions[name].role)
    return [
        statement
        for policy in of_type(synthesized, "AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return action if isinstance(action, list) else [action]


def test_the_worker_runs_on_the_capacity_provider_with_a_gpu_per_environment(gpu_synthesized: Synthesized) -> None:
    ((provider_id, provider),) = of_type(gpu_synthesized, "AWS::Lambda::CapacityProvider").items()
    worker = function(gpu_synthesized, "worker")
    assert worker["AcceleratorConfig"] == {"AcceleratorMemorySize": 24}
    assert (worker["PackageType"], worker["Architectures"]) == ("Image", ["x86_64"])
    assert worker["CapacityProviderConfig"] == {
        "LambdaManagedInstancesCapacityProviderConfig": {
            "CapacityProviderArn": {"Fn::GetAtt": [provider_id, "Arn"]},
            "PerExecutionEnvironmentMaxConcurrency": 1,  # a worker takes one request at a time
            "ExecutionEnvironmentMemoryGiBPerVCpu": deployment.GPU_MEMORY_GIB_PER_VCPU,
        }
    }
    # deployed idle (deactivated) and republished with each deployment: runs raise the fleet (slsml.aws.fleet)
    assert worker["FunctionScalingConfig"] == {"MinExecutionEnvironments": 0, "MaxExecutionEnvironments": 0}
    assert worker["PublishToLatestPublished"] is True
    assert worker["MemorySize"] == deployment.GPU_WORKER_DEFAULTS["memory_mb"]
    assert "ReservedConcurrentExecutions" not in worker  # its fleet bounds its concurrency
    assert "VpcConfig" not in worker  # the capacity provider's VPC is the instances'
    assert provider["Properties"]["InstanceRequirements"] == {
        "AllowedInstanceTypes": ["g6.xlarge"],
        "Architectures": ["x86_64"],
    }
    # Lambda scales the instances (Auto), with room for the default fleet of 8 environments, a g6.xlarge (4 vCPUs) each
    assert provider["Properties"]["CapacityProviderScalingConfig"] == {"MaxVCpuCount": 32, "ScalingMode": "Auto"}
    operator = gpu_synthesized.resources[
        provider["Properties"]["PermissionsConfig"]["CapacityProviderOperatorRoleArn"]["Fn::GetAtt"][0]
    ]
    assert operator["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "lambda.amazonaws.com"
    }
    assert json.dumps(operator["Properties"]["ManagedPolicyArns"]).count(OPERATOR_POLICY) == 1


def test_the_fleet_lives_in_isolated_subnets_reaching_aws_through_endpoints_only(gpu_synthesized: Synthesized) -> None:
    (provider,) = of_type(gpu_synthesized, "AWS::Lambda::CapacityProvider").values()
    subnets = of_type(gpu_synthesized, "AWS::EC2::Subnet")
    assert len(subnets) == deployment.ENDPOINT_AZS
    assert sorted(s["Ref"] for s in provider["Properties"]["VpcConfig"]["SubnetIds"]) == sorted(subnets)
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets.values())
    for kind in ("AWS::EC2::NatGateway", "AWS::EC2::InternetGateway", "AWS::EC2::EIP", "AWS::EC2::Route"):
        assert of_type(gpu_synthesized, kind) == {}, f"{kind}: the VPC has no route out"
    endpoints = of_type(gpu_synthesized, "AWS::EC2::VPCEndpoint").values()
    by_service = {e["Properties"]["ServiceName"]["Fn::Join"][1][-1].lstrip("."): e["Properties"] for e in endpoints}
    assert set(by_service) == {*deployment.GATEWAY_ENDPOINTS, *deployment.INTERFACE_ENDPOINTS}
    for service in deployment.GATEWAY_ENDPOINTS:
        assert by_service[service]["VpcEndpointType"] == "Gateway"
        assert len(by_service[service]["RouteTableIds"]) == deployment.ENDPOINT_AZS
    (instances_sg,) = provider["Properties"]["VpcConfig"]["SecurityGroupIds"]
    for service in deployment.INTERFACE_ENDPOINTS:
        endpoint = by_service[service]
        assert (endpoint["VpcEndpointType"], endpoint["PrivateDnsEnabled"]) == ("Interface", True)
        assert sorted(s["Ref"] for s in endpoint["SubnetIds"]) == sorted(subnets)
        (endpoint_sg,) = endpoint["SecurityGroupIds"]
        ingress = [
            r["Properties"]
            for r in of_type(gpu_synthesized, "AWS::EC2::SecurityGroupIngress").values()
            if r["Properties"]["GroupId"] == endpoint_sg
        ]
        assert [(i["SourceSecurityGroupId"], i["FromPort"], i["ToPort"]) for i in ingress] == [(instances_sg, 443, 443)]
    instances = gpu_synthesized.resources[instances_sg["Fn::GetAtt"][0]]["Properties"]
    assert "SecurityGroupIngress" not in instances
    assert [(e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in instances["SecurityGroupEgress"]] == [
        ("tcp", 443, 443)
    ]


def test_the_worker_image_is_the_cuda_build_of_the_cpu_images_tensorflow(gpu_synthesized: Synthesized) -> None:
    assets = json.loads((gpu_synthesized.outdir / "Slsml.assets.json").read_text())["dockerImages"]
    image_of = {
        name: function(gpu_synthesized, name)["Code"]["ImageUri"]["Fn::Sub"].rsplit(":", 1)[1]
        for name in ("worker", "merger", "run_starter")
    }
    assert assets[image_of["worker"]]["source"]["dockerFile"] == GPU_DOCKERFILE
    assert assets[image_of["merger"]]["source"]["dockerFile"] == DOCKERFILE  # the other TensorFlow steps: CPU
    assert image_of["merger"] == image_of["run_starter"] != image_of["worker"]
    context = gpu_synthesized.outdir / assets[image_of["worker"]]["source"]["directory"]
    assert (context / GPU_DOCKERFILE).is_file()  # in the build context, though .dockerignore leaves it out
    gpu, cpu = (ROOT / GPU_DOCKERFILE).read_text(), (ROOT / DOCKERFILE).read_text()
    (version,) = re.findall(r"tensorflow-cpu==([\d.]+)", cpu)
    assert f'"tensorflow[and-cuda]=={version}"' in gpu
    assert re.findall(r"keras==[\d.]+", gpu) == re.findall(r"keras==[\d.]+", cpu)
    assert "FROM public.ecr.aws/lambda/python:3.13\n" in gpu  # the oldest Python Lambda Managed Instances runs
    assert "COPY functions/worker/handler.py ${LAMBDA_TASK_ROOT}/worker/handler.py" in gpu
    assert 'CMD ["worker.handler.lambda_handler"]' in gpu


def test_only_the_fleet_sizers_may_size_the_fleet_of_the_worker_alone(gpu_synthesized: Synthesized) -> None:
    worker_id = gpu_synthesized.logical_id(gpu_synthesized.stack.compute.functions["worker"])
    worker_arn = {"Fn::GetAtt": [worker_id, "Arn"]}
    published = {"Fn::Join": ["", [worker_arn, f":{deployment.FLEET_QUALIFIER}"]]}
    for fn in wiring.FUNCTIONS:
        variables = function(gpu_synthesized, fn.name).get("Environment", {}).get("Variables", {})
        lambda_statements = [s for s in role_statements(gpu_synthesized, fn.name) if "lambda:" in json.dumps(s)]
        if fn.name not in deployment.FLEET_SIZERS:
            assert deployment.FLEET_FUNCTION_ENV not in variables
            assert lambda_statements == []
            continue
        assert variables[deployment.FLEET_FUNCTION_ENV] == {"Ref": worker_id}
        assert variables[deployment.FLEET_CAP_ENV] == str(deployment.GPU_WORKER_DEFAULTS["max_environments"])
        (statement,) = lambda_statements
        assert sorted(actions(statement)) == [
            "lambda:GetFunctionConfiguration",
            "lambda:GetFunctionScalingConfig",
            "lambda:PutFunctionScalingConfig",
        ]
        assert statement["Resource"] == [worker_arn, published]
        (query,) = [s for s in role_statements(gpu_synthesized, fn.name) if "/index/runs" in json.dumps(s)]
        assert actions(query) == ["dynamodb:Query"]


def test_a_runs_workers_are_capped_by_the_fleet(gpu_synthesized: Synthesized) -> None:
    limits = RunLimits.model_validate_json(
        gpu_synthesized.template.to_json()["Outputs"]["RunLimits"]["Value"]
    )  # what the CLI and the pipeline refuse runs by
    assert limits.workers == deployment.GPU_WORKER_DEFAULTS["max_environments"]
    assert limits.worker_memory_mb == deployment.GPU_WORKER_DEFAULTS["memory_mb"]


ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def _comparable(resource: dict[str, Any]) -> str:
    """``resource`` without its run limits, and without the hashes of its code assets (the two stacks are synthesized
    at different times, and the image's build context is the source tree)."""
    variables = resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
    variables.pop(wiring.RUN_LIMITS_ENV, None)
    return ASSET_HASH.sub("<asset>", json.dumps(resource, sort_keys=True))


def test_without_the_setting_the_stack_is_the_cpu_stack(synthesized: Synthesized, gpu_synthesized: Synthesized) -> None:
    """The GPU worker adds its fleet's resources, and changes the worker, the sizers' environment and policies and
    the run limits (a run's workers capped by the fleet, the worker's memory): nothing else. The CPU stack has none
    of it."""
    cpu, gpu = synthesized.template.to_json(), gpu_synthesized.template.to_json()
    assert {r["Type"] for r in cpu["Resources"].values()} & GPU_ONLY_TYPES == set()
    for resource in cpu["Resources"].values():
        assert not {"CapacityProviderConfig", "AcceleratorConfig", "FunctionScalingConfig", "VpcConfig"} & set(
            resource.get("Properties", {})
        )
    assert "lambda:PutFunctionScalingConfig" not in json.dumps(cpu)
    assert deployment.FLEET_FUNCTION_ENV not in json.dumps(cpu)
    worker = function(synthesized, "worker")
    cpu_defaults = deployment.DEFAULT_FUNCTIONS["worker"]
    assert (worker["MemorySize"], worker["ReservedConcurrentExecutions"]) == (
        cpu_defaults.memory_mb,
        cpu_defaults.reserved_concurrency,
    )
    assets = json.loads((synthesized.outdir / "Slsml.assets.json").read_text())["dockerImages"]
    assert {a["source"]["dockerFile"] for a in assets.values()} == {DOCKERFILE}

    added = set(gpu["Resources"]) - set(cpu["Resources"])
    assert set(cpu["Resources"]) <= set(gpu["Resources"])
    assert {gpu["Resources"][key]["Type"] for key in added} - GPU_ONLY_TYPES <= {
        "AWS::IAM::Role",  # the operator's, the flow log's, the default security group's custom resource's
        "AWS::IAM::Policy",
        "AWS::Logs::LogGroup",  # the flow log's
        "AWS::Lambda::Function",  # the custom resource that empties the VPC's default security group
        "Custom::VpcRestrictDefaultSG",
    }
    compute = gpu_synthesized.stack.compute
    changed_by_gpu = {
        gpu_synthesized.logical_id(compute.functions[name]) for name in ("worker", *deployment.FLEET_SIZERS)
    }
    changed_by_gpu |= {
        gpu_synthesized.stack.get_logical_id(
            compute.functions[name].role.node.find_child("DefaultPolicy").node.default_child
        )
        for name in deployment.FLEET_SIZERS
    }
    changed = {
        key for key in cpu["Resources"] if _comparable(cpu["Resources"][key]) != _comparable(gpu["Resources"][key])
    }
    assert changed == changed_by_gpu
    assert {k: v for k, v in cpu["Outputs"].items() if k != "RunLimits"} == {
        k: v for k, v in gpu["Outputs"].items() if k != "RunLimits"
    }


@pytest.mark.parametrize(
    ("functions", "refusal"),
    [
        (
            {"reducer": {"accelerator_gib": 24}},
            "functions.reducer.accelerator_gib=24: only the worker may run on a GPU",
        ),
        ({"merger": {"accelerator_gib": 12}}, "functions.merger.accelerator_gib=12: only the worker may run on a GPU"),
        ({"worker": {"accelerator_gib": 20}}, "accelerator_gib"),  # not a size Lambda offers
        ({"worker": {"accelerator_gib": 48}}, "functions.worker.accelerator_gib=48: the GPU of a g6.xlarge has 24 GiB"),
        ({"worker": {"accelerator_gib": 24, "memory_mb": 3008}}, "functions.worker.memory_mb=3008: a GPU function's"),
        ({"worker": {"accelerator_gib": 24, "memory_mb": 10240}}, "(5 vCPUs): more than a g6.xlarge (4 vCPUs, 16 GiB)"),
        (
            {"worker": {"accelerator_gib": 24, "reserved_concurrency": 50}},
            "a GPU function's concurrency is its fleet's",
        ),
        ({"worker": {"accelerator_gib": 24, "instance_types": ["p5.48xlarge"]}}, "not GPU instance types slsml knows"),
        ({"worker": {"accelerator_gib": 24, "instance_types": []}}, "functions.worker.instance_types: name at least"),
        ({"worker": {"instance_types": ["g6.xlarge"]}}, "size a GPU fleet: set accelerator_gib too"),
        ({"worker": {"max_environments": 4}}, "size a GPU fleet: set accelerator_gib too"),
    ],
)
def test_gpu_settings_are_checked_and_only_the_worker_may_have_a_gpu(functions: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(refusal)):
        Settings.from_context(App(context={"functions": functions}).node)


def test_runs_may_not_ask_for_more_workers_than_the_fleet_holds() -> None:
    context = {"functions": {"worker": {"accelerator_gib": 24, "max_environments": 4}}, "run_limits": {"workers": 16}}
    with pytest.raises(ValidationError, match=re.escape("run_limits.workers=16: a GPU worker's fleet has at most")):
        Settings.from_context(App(context=context).node)


def test_a_gpu_workers_settings_default_to_a_fleet_of_g6_instances(tmp_path: Path) -> None:
    settings = Settings.from_context(App(context={"functions": '{"worker": {"accelerator_gib": 16}}'}).node)
    worker = settings.functions["worker"]
    assert worker.gpu and settings.gpu_worker == worker
    assert (worker.memory_mb, worker.reserved_concurrency, worker.instance_types, worker.max_environments) == (
        4096,
        None,
        ("g6.xlarge",),
        8,
    )
    assert worker.timeout_s == deployment.DEFAULT_FUNCTIONS["worker"].timeout_s
    assert Settings.from_context(App().node).gpu_worker is None  # no setting: a CPU worker


@pytest.mark.parametrize("memory_mb", [2048, 3008, 4096, 6144, 8192, 10240])
def test_the_plan_refuses_the_gpu_worker_the_stack_refuses(
    memory_mb: int, capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no calibration file
    context = {"functions": {"worker": {"accelerator_gib": 24, "memory_mb": memory_mb}}}
    try:
        Settings.from_context(App(context=context).node)
        refusal = None
    except ValidationError as error:
        refusal = str(error.errors()[0]["msg"]).removeprefix("Value error, ")
    argv = ["plan", "--params", "2000000", "--iterations", "3", "--accelerator", "worker=24"]
    code = main([*argv, "--memory", f"worker={memory_mb}"])
    err = capsys.readouterr().err.strip()
    if refusal is None:
        assert code == 0, err
    else:
        assert code == 2 and len(err.splitlines()) == 1 and refusal in err, (refusal, err)
    # what the stack refuses: not a multiple of 2,048 MB; 5 vCPUs, more than a g6.xlarge's 4
    assert (refusal is not None) == (memory_mb in (3008, 10240))
