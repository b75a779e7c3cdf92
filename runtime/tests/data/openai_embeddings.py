"""The OpenAI Python client's `embeddings.create` against `modelc serve --embedding` (argv[1]:
its base URL; argv[2]: the model's alias; argv[3]: a text). runtime/tests/embeddings.rs runs
it with the virtual environment of scripts/fetch-server-tests. Checks the response's shape,
then prints one JSON line: the text's embedding as floats (`encoding_format="float"`) and as
the client decodes base64 (its default)."""
import json
import sys

import openai

base, alias, text = sys.argv[1:4]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)

floats = client.embeddings.create(model=alias, input=[text, "second"], encoding_format="float")
assert floats.object == "list", floats
assert [d.index for d in floats.data] == [0, 1], floats
assert all(d.object == "embedding" for d in floats.data), floats
assert floats.model == alias, floats.model
assert floats.usage.prompt_tokens == floats.usage.total_tokens > 2, floats.usage
norm = sum(x * x for x in floats.data[0].embedding)
assert abs(norm - 1) < 1e-3, norm

# The client asks for base64 unless told otherwise, and decodes it to floats.
b64 = client.embeddings.create(model=alias, input=text)
assert len(b64.data) == 1, b64

print(json.dumps({"float": floats.data[0].embedding, "base64": list(b64.data[0].embedding)}))
