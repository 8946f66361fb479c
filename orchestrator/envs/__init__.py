"""Multi-turn environments (tool use, games, agents' conversations), one episode per instance.

- `base`: the contract an environment implements (`Environment`, `ModelTurn`, `StepResult`).
- `registry`: `resolve_env(spec)`, built-in names or a user's `path.py:Class` / `module:Class`.
- `lookup`: the built-in tool-use environment; `verifiers_env`: environments of the verifiers library.
- `runner`: the inference worker's episode runner (turns, budgets, timeouts, scoring).
- `render`: the conversation rendered with the chat template, append-only over the sampled ids.
- `pool`, `watch`: the bounded pool blocking calls run on, and the environment loop's liveness stamp.
- `agent`: `task.agent`, an agent over HTTP as the episode (`registry.resolve_agent`); `endpoint`: the
  worker's OpenAI-compatible endpoint (aiohttp, imported only there); `agent_session`: one episode's
  calls appended to its trajectory's branches; `openai_api`: the wire format (`responses_api`: the
  Responses API subset, `sse`: streamed answers); `tool_parser`: tool calls (hermes);
  `agent_lookup`: the built-in lookup agent; `verifiers_agent`: a verifiers 0.4 env as the agent.

Imports: config, errors, data's tokens and rewards, and this room.
"""
