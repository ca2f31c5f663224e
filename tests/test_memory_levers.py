"""Memory levers (issue #17), each a switch off by default: gradient checkpointing of the AR blocks,
LoRA on the AR transformer (reference = adapters disabled), and a dtype per real reward model."""

import pytest
import torch
from builders_policies import tiny_harmon, tiny_nova
from helpers import PROMPTS, SAMPLING, assert_ratio_is_one, make_trainer, tiny_policy

from margrpo.experiment.config import load_config, train_spec, validate_train_spec
from margrpo.grpo.rollout import generate
from margrpo.grpo.trainer import GRPOConfig
from margrpo.policy import load_policy
from margrpo.policy.base import deterministic
from margrpo.policy.lora import adapter_parameters, adapters_disabled, add_lora, lora_layers
from margrpo.policy.settings import PolicySettings

MAKERS = {"toy": tiny_policy, "nova": tiny_nova, "harmon": tiny_harmon}
LEVER_RUN = dict(steps=1, lr=1e-2)  # make_trainer's run here: one step, at a rate that moves LoRA's adapters


def ar_inputs(policy, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(4, policy.seq_len, policy.token_dim, generator=g)
    known = torch.rand(4, policy.seq_len, generator=g) < 0.5
    with torch.no_grad():
        cond = policy.encode_prompts(PROMPTS)
    return tokens, known, cond


def ar_loss(policy, inputs):
    tokens, known, cond = inputs
    return policy.ar_forward(tokens, known, policy.prepare_condition(cond)).square().mean()


def grads(policy, inputs):
    policy.zero_grad(set_to_none=True)
    with deterministic(policy):  # eval mode, as GRPO's replay: checkpointing must act there too
        ar_loss(policy, inputs).backward()
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


# --- gradient checkpointing -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["toy", "nova", "harmon"])
def test_gradient_checkpointing_gives_the_same_gradients(kind):
    policy = MAKERS[kind]()
    inputs = ar_inputs(policy)
    block = {
        "toy": lambda: policy.blocks[0],
        "nova": lambda: policy.transformer.image_encoder.blocks[0],
        "harmon": lambda: policy.llm.model.layers[0],
    }[kind]()
    calls = []
    block.register_forward_pre_hook(lambda *a: calls.append(1))  # pre: recomputation stops early
    plain, n_plain = grads(policy, inputs), len(calls)
    policy.set_gradient_checkpointing(True)
    checkpointed = grads(policy, inputs)
    assert len(calls) - n_plain == 2 * n_plain  # each block's forward ran again in backward
    assert plain.keys() == checkpointed.keys() and plain
    for n, g in plain.items():
        assert torch.allclose(checkpointed[n], g, rtol=1e-5, atol=1e-5 * g.abs().max().item()), n
    if kind == "harmon":
        mar = policy.mar.encoder_blocks[0]
        mar.register_forward_pre_hook(lambda *a: calls.append(1))  # pre: recomputation stops early
    policy.set_gradient_checkpointing(False)
    start = len(calls)
    again = grads(policy, inputs)
    assert len(calls) - start == n_plain * (2 if kind == "harmon" else 1)  # no recomputation once off
    assert all(torch.equal(again[n], g) for n, g in plain.items())


HEAD_BLOCKS = {
    "toy": lambda p: p.diffloss.blocks,
    "nova": lambda p: p.transformer.image_decoder.blocks,
    "harmon": lambda p: p.mar.diffloss.net.res_blocks,
}


@pytest.mark.parametrize("kind", ["toy", "nova", "harmon"])
def test_gradient_checkpointing_recomputes_the_heads_blocks_with_the_same_gradients(kind):
    """The replay's head rows (every unknown token x diffusion steps x CFG) hold most of Harmon's activations
    (docs/real-scale.md, memory plan): checkpointing covers the head's blocks too, with the same gradients."""
    policy = MAKERS[kind]()
    tokens, known, cond = ar_inputs(policy)
    g = torch.Generator().manual_seed(3)
    rows = 24
    x_t = torch.randn(rows, policy.token_dim, generator=g)
    t = torch.randint(1, 900, (rows,), generator=g).float()
    calls = []
    HEAD_BLOCKS[kind](policy)[0].register_forward_pre_hook(lambda *a: calls.append(1))

    def head_grads():
        policy.zero_grad(set_to_none=True)
        with deterministic(policy):
            z = policy.ar_forward(tokens, known, policy.prepare_condition(cond)).flatten(0, 1)[:rows]
            policy.head(x_t, t, z).square().mean().backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    plain, n_plain = head_grads(), len(calls)
    policy.set_gradient_checkpointing(True)
    checkpointed = head_grads()
    assert n_plain == 1 and len(calls) - n_plain == 2  # the block's forward ran again in backward
    assert plain.keys() == checkpointed.keys() and plain
    for n, grad in plain.items():
        assert torch.allclose(checkpointed[n], grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item()), n


def test_gradient_checkpointing_is_off_by_default_and_routed(tmp_path):
    assert PolicySettings().gradient_checkpointing is False and PolicySettings().lora is None
    trainer = make_trainer(tmp_path, gradient_checkpointing=True, **LEVER_RUN)
    assert trainer.policy.gradient_checkpointing
    assert not make_trainer(tmp_path / "b", **LEVER_RUN).policy.gradient_checkpointing


def test_policy_keys_reach_the_policy_settings():
    base = load_config({})
    spec = train_spec(base, "toy-nova", "toyclip", "grpo")
    assert "gradient_checkpointing" not in spec["grpo"] and "lora" not in spec["grpo"]  # cached specs unchanged
    assert "policy" not in spec
    config = load_config(
        {"policies": {"toy-nova": {"kind": "toy", "gradient_checkpointing": True, "lora": {"rank": 4}}}}
    )
    spec = validate_train_spec(train_spec(config, "toy-nova", "toyclip", "grpo"))
    settings = PolicySettings.from_spec(spec)
    assert settings.gradient_checkpointing is True
    assert settings.lora == {"rank": 4, "alpha": None, "dropout": 0.0, "target_modules": None}
    assert "lora" not in spec["grpo"] and GRPOConfig.from_spec(spec).lr > 0  # GRPO's section holds GRPO's keys


# --- LoRA ---------------------------------------------------------------------------------------------
def perturb_adapters(policy, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_parameters(policy):
            p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("kind", ["toy", "nova"])
def test_lora_reference_is_the_base_model(kind):
    policy = MAKERS[kind]().eval()
    inputs = ar_inputs(policy)
    with torch.no_grad():
        base = ar_loss(policy, inputs), policy.state_dict()
        add_lora(policy, {"rank": 4})
        assert lora_layers(policy) and policy.state_dict().keys() == base[1].keys()  # the policy's own keys
        assert torch.equal(ar_loss(policy, inputs), base[0])  # B = 0: adapters start as the identity
        perturb_adapters(policy)
        assert not torch.equal(ar_loss(policy, inputs), base[0])
        with adapters_disabled(policy):
            assert torch.equal(ar_loss(policy, inputs), base[0])
        assert not torch.equal(ar_loss(policy, inputs), base[0])  # enabled again afterwards


@pytest.mark.parametrize("kind", ["toy", "nova"])
def test_lora_trains_the_adapters_alone(tmp_path, kind):
    trainer = make_trainer(tmp_path, MAKERS[kind](), lora={"rank": 4}, beta=0.5, **LEVER_RUN)
    policy = trainer.policy
    assert trainer.ref is policy  # no deep copy
    adapters = set(map(id, adapter_parameters(policy)))
    assert {id(p) for g in trainer.optimizer.param_groups for p in g["params"]} == adapters
    assert all(p.requires_grad == (id(p) in adapters) for p in policy.parameters())
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    row = trainer.train_step()
    assert row["kl_paper"] >= 0 and row["ratio_min"] == pytest.approx(1.0, abs=1e-5)
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed), changed
    assert any(".lora_B." in n for n in changed)
    assert all(p.requires_grad == (id(p) in adapters) for p in policy.parameters())  # the reference pass kept them


def test_lora_ratio_is_one_on_unchanged_parameters():
    policy = tiny_policy("flow")
    add_lora(policy, {"rank": 4, "dropout": 0.1})  # dropout is off in rollout and replay (eval mode)
    perturb_adapters(policy)
    r = generate(
        policy,
        PROMPTS[:2],
        SAMPLING,
        group_size=2,
        generator=torch.Generator().manual_seed(0),
        trajectories=2,
        mte_generator=torch.Generator().manual_seed(9),
    )
    assert_ratio_is_one(policy, r)


@pytest.mark.parametrize("kind", ["toy", "nova"])
def test_lora_save_load_round_trip(tmp_path, kind):
    trainer = make_trainer(tmp_path / "run", MAKERS[kind](), lora={"rank": 4, "alpha": 8}, **LEVER_RUN)
    trainer.train()
    ckpt = tmp_path / "run" / "state" / "ckpt-000001" / "policy"
    assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / "adapter_config.json").is_file()
    policy = trainer.policy.eval()
    inputs = ar_inputs(policy)
    loaded = load_policy(ckpt).eval()
    with torch.no_grad():
        assert lora_layers(loaded)
        assert torch.equal(ar_loss(loaded, inputs), ar_loss(policy, inputs))
        with adapters_disabled(loaded), adapters_disabled(policy):
            assert torch.equal(ar_loss(loaded, inputs), ar_loss(policy, inputs))
    # the trainer's resume restores the adapters into a fresh policy
    again = make_trainer(tmp_path / "run", MAKERS[kind](), lora={"rank": 4, "alpha": 8}, **LEVER_RUN)
    assert again.try_resume() and again.step == 1
    with torch.no_grad():
        assert torch.equal(ar_loss(again.policy.eval(), inputs), ar_loss(policy, inputs))


def test_lora_unknown_targets_are_an_error():
    with pytest.raises(ValueError, match="not found"):
        add_lora(tiny_policy(), {"target_modules": ["nope"]})


# --- reward-model dtype -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["clipscore", "pickscore", "aesthetic", "vqa", "git_vqa"])
def test_reward_model_dtype(request, name):
    scorers = request.getfixturevalue("tiny")  # conftest's tiny local scorer models
    from margrpo.rewards import build_reward

    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["a red circle", "two blue squares", "a green triangle on the left of a red circle"]
    full = build_reward(name, **scorers[name])(images, prompts, [{}] * 3)
    half = build_reward(name, **scorers[name], dtype="bfloat16")
    model = {
        "clipscore": lambda: half.clip.model,
        "pickscore": lambda: half.clip.model,
        "aesthetic": lambda: half.vision,
    }.get(name, lambda: half.model)()
    assert next(model.parameters()).dtype == torch.bfloat16
    scores = half(images, prompts, [{}] * 3)
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
    assert torch.allclose(scores, full, rtol=0.05, atol=0.05 * max(full.abs().max().item(), 1e-3)), (scores, full)
    with pytest.raises(ValueError, match="dtype"):
        build_reward(name, **scorers[name], dtype="int8")


def test_grounding_dino_is_float32_only(request):
    scorers = request.getfixturevalue("tiny")
    from margrpo.rewards import build_reward

    with pytest.raises(ValueError, match="not supported"):
        build_reward("grounding_dino", **scorers["grounding_dino"], dtype="bfloat16")


@pytest.mark.parametrize("kind", ["toy", "nova", "harmon"])
def test_gradient_checkpointing_recomputes_in_the_mode_of_the_forward_pass(kind):
    """As GRPO's trainer: the replay (cond and uncond passes, bf16 autocast) runs in eval mode inside
    `deterministic`, and backward runs after it, with the policy back in train mode. The blocks used to
    be recomputed in train mode, with MAR-H's dropout: torch refused ("recomputed values ... different
    metadata"; Harmon-1.5B on an H200). Now the same gradients as without checkpointing."""
    policy = MAKERS[kind]()
    policy.train()
    tokens, known, cond = ar_inputs(policy)

    def replay_grads():
        policy.zero_grad(set_to_none=True)
        with deterministic(policy), torch.autocast("cpu", dtype=torch.bfloat16):
            c = policy.prepare_condition(cond)
            u = policy.prepare_condition(policy.null_condition(len(tokens)))
            loss = (
                (policy.ar_forward(tokens, known, c).float() - policy.ar_forward(tokens, known, u).float())
                .square()
                .mean()
            )
        loss.backward()
        return {n: p.grad.float().clone() for n, p in policy.named_parameters() if p.grad is not None}

    plain = replay_grads()
    policy.set_gradient_checkpointing(True)
    checkpointed = replay_grads()
    assert policy.training and plain.keys() == checkpointed.keys() and plain
    for n, g in plain.items():
        assert torch.allclose(checkpointed[n], g, rtol=1e-2, atol=1e-2 * g.abs().max().item()), n
