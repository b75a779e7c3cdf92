"""The OpenAI Python client's tool calls against a running `modelc serve` (argv[1]: its base
URL; argv[2]: the model's alias) started with a Hermes/Qwen chat template. SmolLM2 is too
small to call tools by itself, so the calls are asked for (`tool_choice` "required" or a
named function): the grammar makes them well-formed. Whole and streamed answers carry the
same call; a tool result goes back through the template; `tool_choice: none` gives text.
Prints "ok" when every check passes; an assertion error otherwise."""
import json
import sys

import openai

base, alias = sys.argv[1:3]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)

weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}
clock = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
args = dict(model=alias, messages=messages, max_tokens=64, temperature=0)

whole = client.chat.completions.create(tools=[weather], tool_choice="required", **args)
choice = whole.choices[0]
assert choice.finish_reason == "tool_calls", whole
calls = choice.message.tool_calls
assert calls and len(calls) == 1, whole
call = calls[0]
assert call.type == "function" and call.id, call
assert call.function.name == "get_weather", call
arguments = json.loads(call.function.arguments)
assert isinstance(arguments.get("location"), str), arguments
assert choice.message.content in (None, ""), choice.message

stream = client.chat.completions.create(
    tools=[weather], tool_choice="required", stream=True, **args
)
streamed, finish, text = {}, None, ""
for chunk in stream:
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    text += delta.content or ""
    for c in delta.tool_calls or []:
        entry = streamed.setdefault(c.index, {"id": None, "name": "", "arguments": ""})
        entry["id"] = c.id or entry["id"]
        if c.function is not None:
            entry["name"] += c.function.name or ""
            entry["arguments"] += c.function.arguments or ""
    finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls", finish
assert text == "", text
assert list(streamed) == [0], streamed
assert streamed[0]["id"], streamed
assert streamed[0]["name"] == "get_weather", streamed
assert json.loads(streamed[0]["arguments"]) == arguments, (streamed, arguments)

named = client.chat.completions.create(
    tools=[weather, clock],
    tool_choice={"type": "function", "function": {"name": "get_time"}},
    **args,
)
ncall = named.choices[0].message.tool_calls[0]
assert ncall.function.name == "get_time", named
assert json.loads(ncall.function.arguments)["zone"] in ("UTC", "CET"), ncall

none = client.chat.completions.create(tools=[weather], tool_choice="none", **args)
assert not none.choices[0].message.tool_calls, none
assert none.choices[0].finish_reason in ("stop", "length"), none

# The call and its result go back through the template; the model answers in text.
history = messages + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
]
after = client.chat.completions.create(
    model=alias, messages=history, tools=[weather], max_tokens=16, temperature=0
)
assert after.choices[0].message.content, after
assert after.usage.prompt_tokens > whole.usage.prompt_tokens, (after.usage, whole.usage)

print("ok")
