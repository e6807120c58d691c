#!/usr/bin/env python3
"""Serves the demo page on localhost with the headers that make it cross-origin isolated
(COOP same-origin, COEP require-corp), so the page gets SharedArrayBuffer and the threaded module.

    /usr/bin/python3 web/demo/serve.py [--port 8000] [--web-build build-web] [--fixtures build-web/fixtures]

URL paths: /demo/ (this folder), /onnxtrain.mjs, /wasm/ (the built module), /data/ (the digits
artifacts and data from web/tests/make_fixtures.py). Nothing else of the tree is served.
"""
import argparse
import http.server
import os
import sys

WEB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(WEB)


def make_handler(web_build: str, fixtures: str):
    routes = {"/demo/": os.path.join(WEB, "demo"), "/wasm/": os.path.join(web_build, "web"), "/data/": fixtures}
    files = {"/onnxtrain.mjs": os.path.join(WEB, "onnxtrain.mjs")}

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                          ".js": "text/javascript", ".wasm": "application/wasm"}

        def translate_path(self, path):
            path = path.split("?", 1)[0].split("#", 1)[0]
            if path in files:
                return files[path]
            for prefix, folder in routes.items():
                if path.startswith(prefix):
                    rel = os.path.normpath(path[len(prefix):]).lstrip("/")
                    if rel.startswith(".."):
                        break
                    return os.path.join(folder, rel)
            return os.path.join(WEB, "demo", "not-found")

        def do_GET(self):
            if self.path in ("/", "/index.html"):
                self.send_response(302)
                self.send_header("Location", "/demo/index.html")
                self.end_headers()
                return
            super().do_GET()

        def end_headers(self):
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            self.send_header("Cache-Control", "no-store")
            super().end_headers()

        def log_message(self, *args):
            if os.environ.get("ONNXTRAIN_DEMO_LOG"):
                super().log_message(*args)

    return Handler


def serve(port: int, web_build: str, fixtures: str) -> http.server.ThreadingHTTPServer:
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), make_handler(web_build, fixtures))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--web-build", default=os.path.join(ROOT, "build-web"))
    parser.add_argument("--fixtures", default=os.path.join(ROOT, "build-web", "fixtures"))
    args = parser.parse_args()
    server = serve(args.port, os.path.abspath(args.web_build), os.path.abspath(args.fixtures))
    print(f"onnxtrain demo: http://localhost:{server.server_address[1]}/demo/index.html (Ctrl-C stops it)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
