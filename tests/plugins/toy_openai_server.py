"""The toy serving engine's server (quantgate_toy_serve.py): `python toy_openai_server.py MODEL_DIR NAME PORT
--max-model-len N`. The OpenAI completions API on token-id prompts, one request at a time, greedy decoding with
transformers, streamed one token per chunk, with usage; /health and /v1/models. Standard library and transformers
only."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, served_name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
max_model_len = int(sys.argv[sys.argv.index("--max-model-len") + 1])
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
lock = threading.Lock()
print("toyserve: decoding with ToyGreedyLoop", flush=True)


def greedy(prompt, max_tokens, stop_ids):
    """Yields the new token ids one by one (the model's greedy choice, with its KV cache)."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(max_tokens):
            token = int(out.logits[0, -1].argmax())
            if token in stop_ids:
                return
            yield token
            out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {})
        if self.path == "/v1/models":
            return self._json(200, {"data": [{"id": served_name, "root": model_dir, "owned_by": "toyserve",
                                              "max_model_len": max_model_len}]})
        self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        if self.path != "/v1/completions":
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = list(request["prompt"])
        stop_ids = set() if request.get("ignore_eos") else set(request.get("stop_token_ids") or [])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        new, shown = [], ""
        with lock:
            for token in greedy(prompt, int(request["max_tokens"]), stop_ids):
                new.append(token)
                text = tokenizer.decode(new, skip_special_tokens=True)
                self._event({"choices": [{"index": 0, "text": text[len(shown):], "finish_reason": None}]})
                shown = text
        finish = "length" if len(new) >= int(request["max_tokens"]) else "stop"
        self._event({"choices": [{"index": 0, "text": "", "finish_reason": finish}]})
        self._event({"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(new)}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, value):
        self.wfile.write(f"data: {json.dumps(value)}\n\n".encode())
        self.wfile.flush()


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
