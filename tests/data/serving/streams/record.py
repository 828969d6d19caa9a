"""Record vLLM's own chat stream for two GLM-5.3 tool calls (README.md beside this file says why).

Run with the `tests` nox environment's python (vLLM 0.33.0, unpatched): it rewrites both .sse files
beside it. `created` and the tool call's random id are fixed so that a rerun gives the same bytes.
"""

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[2]
sys.path.insert(0, str(TESTS))

from probes import GLM_SERVER_PROBE_HEAD  # noqa: E402

RECORD = GLM_SERVER_PROBE_HEAD + r'''
import asyncio
import sys
from pathlib import Path

tests = Path(sys.argv[1])
hf = glm_tokenizer((tests / "data" / "glm53" / "chat_template.jinja").read_text())
outputs = json.loads((tests / "data" / "glm53" / "outputs.json").read_text())
by_id = {o["id"]: o for o in outputs["outputs"] + outputs["neighbours"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
messages = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
prompt_ids = hf.encode(hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)


async def stream(text):
    async def results():
        for output in engine_outputs(hf, text, prompt_ids, streamed=True):
            yield output

    request = ChatCompletionRequest(model="glm53", messages=messages, stream=True, tools=TOOLS, tool_choice="auto")
    meta = RequestResponseMetadata(request_id="chatcmpl-recorded")
    return "".join([line async for line in chat_server(GLM_PARSER).chat_completion_stream_generator(
        request, results(), "chatcmpl-recorded", "glm53", conversation=messages, tokenizer=hf, request_metadata=meta)])

print(json.dumps({name: asyncio.run(stream(by_id[oid]["text"])) for name, oid in (
    ("tool-call-think-in-arguments", "handwritten-think-in-arguments"), ("tool-call-good", "handwritten-tool-call"))}))
'''


def main() -> None:
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-c", RECORD, str(TESTS)], capture_output=True, text=True, check=True)
    for name, body in json.loads(done.stdout.splitlines()[-1]).items():
        body = re.sub(r'"created":\d+', '"created":1796190000', body)
        body = re.sub(r'"id":"chatcmpl-tool-[0-9a-f]+"', '"id":"chatcmpl-tool-recorded"', body)
        (HERE / f"{name}.sse").write_text(body)
        print(name, len(body))


if __name__ == "__main__":
    main()
