"""The OpenAI Python client (PyPI `openai`) against a running `modelc serve` (argv[1]: its
base URL; argv[2]: the API key; argv[3]: the model's alias). runtime/tests/server.rs runs it
with the virtual environment of scripts/fetch-server-tests. Prints "ok" when every check
passes; an assertion error otherwise."""
import sys

import openai

base, key, alias = sys.argv[1:4]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)

models = client.models.list()
assert [m.id for m in models.data] == [alias], models

messages = [{"role": "user", "content": "Say hello."}]
whole = client.chat.completions.create(
    model=alias, messages=messages, max_tokens=8, temperature=0
)
choice = whole.choices[0]
assert choice.message.role == "assistant", whole
assert choice.finish_reason in ("stop", "length"), whole
assert whole.usage.completion_tokens >= 1, whole.usage
assert whole.usage.prompt_tokens > 5, whole.usage
assert (
    whole.usage.total_tokens
    == whole.usage.prompt_tokens + whole.usage.completion_tokens
), whole.usage

stream = client.chat.completions.create(
    model=alias,
    messages=messages,
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
parts, usage, finish = [], None, None
for chunk in stream:
    if chunk.choices:
        parts.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage is not None:
        usage = chunk.usage
assert "".join(parts) == choice.message.content, (parts, choice.message.content)
assert finish == choice.finish_reason, finish
assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage
assert usage.prompt_tokens == whole.usage.prompt_tokens, usage

text = client.completions.create(
    model=alias, prompt="The capital of France is", max_tokens=4, temperature=0
)
assert text.usage.completion_tokens == 4, text.usage
assert len(text.choices[0].text) > 0, text

try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
        model=alias, messages=messages, max_tokens=2
    )
    raise AssertionError("a wrong API key was accepted")
except openai.AuthenticationError:
    pass

print("ok")
