"""Who can prove which messages, read from the synthesized template: each role's grants on the signing key (its IAM
policies) under the key's own policy (its Deny statements, evaluated as the local cloud evaluates them). A role can
unseal its own kind's private keys alone (a role that signs nothing: none) and the launch's vouch for a run's public
keys, only the step that launches runs makes key pairs and vouches for them (encrypts), and no role can re-encrypt a
sealed key under another kind: no role can prove another kind's messages, nor put keys of its own making in a
run's item."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from slsml.local.moto_server import PRINCIPAL_ARN, denials, denied
from slsml.spec import deployment, wiring

from .test_infra_least_privilege import as_list, render, role_statements

if TYPE_CHECKING:
    from conftest import Synthesized

KIND = deployment.SIGNING_KIND.lower()
KEY_ACTIONS = ("kms:Decrypt", deployment.MAKE_KEY_PAIRS, deployment.VOUCH_ACTION, "kms:ReEncryptFrom")


def rendered(value: Any) -> Any:
    """A policy document with its intrinsics as text (``render``)."""
    if isinstance(value, list):
        return [rendered(item) for item in value]
    if isinstance(value, dict) and not {"Ref", "Fn::GetAtt", "Fn::Join", "Fn::Select"} & value.keys():
        return {name: rendered(item) for name, item in value.items()}
    return render(value)


def _key(synthesized: Synthesized) -> tuple[str, Any]:
    key_id = synthesized.logical_id(synthesized.stack.signing.key)
    return f"<{key_id}.Arn>", synthesized.resources[key_id]["Properties"]


def _role_id(synthesized: Synthesized, function: str) -> str:
    fn = synthesized.stack.compute.functions[function]
    props = synthesized.resources[synthesized.logical_id(fn)]["Properties"]
    return props["Role"]["Fn::GetAtt"][0]


def _allowed(statement: dict[str, Any], action: str, key: str, kind: str) -> bool:
    """Whether an IAM Allow statement grants ``action`` on ``key`` with ``kind`` in the encryption context."""
    resources = {render(r) for r in as_list(statement["Resource"])}
    if action not in as_list(statement["Action"]) or not resources & {key, "*"}:
        return False
    named = statement.get("Condition", {}).get("StringEquals", {}).get(deployment.SIGNING_KIND)
    return named is None or kind in as_list(named)


def usable(synthesized: Synthesized) -> dict[str, dict[str, set[str]]]:
    """Function → action on the signing key → the kinds (encryption contexts) it may take it with: granted by its
    role's policies and not denied by the key's."""
    key, props = _key(synthesized)
    policy = denials(json.dumps(rendered(props["KeyPolicy"])).encode())
    kinds = (*wiring.SIGNERS, deployment.VOUCH, "another")
    found: dict[str, dict[str, set[str]]] = {}
    for fn in wiring.FUNCTIONS:
        role_id = _role_id(synthesized, fn.name)
        statements = list(role_statements(synthesized, role_id))
        found[fn.name] = {
            action: {
                kind
                for kind in kinds
                if any(_allowed(s, action, key, kind) for s in statements)
                and not denied(policy, action, key, {PRINCIPAL_ARN: f"<{role_id}.Arn>", KIND: kind})
            }
            for action in KEY_ACTIONS
        }
    return found


def test_each_role_can_unseal_its_own_kinds_keys_alone_and_only_the_launcher_makes_them(
    synthesized: Synthesized,
) -> None:
    found = usable(synthesized)
    for fn in wiring.FUNCTIONS:
        own = {fn.name} if fn.name in wiring.SIGNERS else set()
        assert found[fn.name]["kms:Decrypt"] == own | {deployment.VOUCH}, (fn.name, found[fn.name])
        assert found[fn.name]["kms:ReEncryptFrom"] == set(), fn.name
        makes = found[fn.name][deployment.MAKE_KEY_PAIRS]
        assert makes == (set((*wiring.SIGNERS, deployment.VOUCH, "another")) if fn.makes_run_keys else set()), (
            fn.name,
            makes,
        )
        vouches = found[fn.name][deployment.VOUCH_ACTION]
        assert vouches == ({deployment.VOUCH} if fn.makes_run_keys else set()), (fn.name, vouches)
    assert [fn.name for fn in wiring.FUNCTIONS if found[fn.name][deployment.MAKE_KEY_PAIRS]] == ["work_launcher"]
    assert [fn.name for fn in wiring.FUNCTIONS if found[fn.name][deployment.VOUCH_ACTION]] == ["work_launcher"]


def test_the_keys_policy_denies_each_role_the_other_kinds_whatever_it_were_granted(synthesized: Synthesized) -> None:
    """Were a role granted kms:* on the key, its policy would still refuse it every other kind's private key, and any
    vouch for a run's public keys to all but the launcher."""
    key, props = _key(synthesized)
    policy = denials(json.dumps(rendered(props["KeyPolicy"])).encode())
    for fn in wiring.FUNCTIONS:
        principal = f"<{_role_id(synthesized, fn.name)}.Arn>"
        unsealable = {
            kind
            for kind in (*wiring.SIGNERS, deployment.VOUCH)
            if not denied(policy, "kms:Decrypt", key, {PRINCIPAL_ARN: principal, KIND: kind})
        }
        assert unsealable == ({fn.name} if fn.name in wiring.SIGNERS else set()) | {deployment.VOUCH}, fn.name
        vouching = not denied(policy, deployment.VOUCH_ACTION, key, {PRINCIPAL_ARN: principal, KIND: deployment.VOUCH})
        assert vouching == fn.makes_run_keys, fn.name
    assert props["EnableKeyRotation"] is True


def test_no_other_principal_of_the_stack_may_use_the_signing_key(synthesized: Synthesized) -> None:
    """Only the function roles hold grants on the signing key (the account's own statement aside): not the state
    machine's role, nor any custom resource's."""
    key, _ = _key(synthesized)
    roles = {_role_id(synthesized, fn.name) for fn in wiring.FUNCTIONS}
    for name, resource in synthesized.resources.items():
        if resource["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::Role") or name in roles:
            continue
        props = resource["Properties"]
        if set(map(str, props.get("Roles", []))) & {str({"Ref": role}) for role in roles}:
            continue
        documents = [props.get("PolicyDocument")] + [p["PolicyDocument"] for p in props.get("Policies", [])]
        for document in filter(None, documents):
            for statement in document["Statement"]:
                named = {render(r) for r in as_list(statement.get("Resource", []))}
                assert not named & {key, "*"} or not [
                    a for a in as_list(statement["Action"]) if a.startswith("kms:")
                ], (
                    name,
                    statement,
                )
