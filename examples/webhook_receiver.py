"""A webhook receiver for Ratchet's relay, with nothing but Python's standard
library: it checks each request's Standard Webhooks signature, rejects stale
timestamps, and processes each event once by its `webhook-id`.

    HOOKS_SECRET=whsec_... python3 examples/webhook_receiver.py 9000

A real receiver keeps the ids it processed in its own database, in the same
transaction as the event's effect, instead of in memory.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

SECRET = base64.b64decode(os.environ["HOOKS_SECRET"].removeprefix("whsec_"))
TOLERANCE_S = 5 * 60
seen = set()


def signature_ok(headers, body):
    msg_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(SECRET, signed, hashlib.sha256).digest()).decode()
    given = [s.removeprefix("v1,") for s in headers.get("webhook-signature", "").split()]
    fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) < TOLERANCE_S
    return fresh and any(hmac.compare_digest(expected, g) for g in given)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if not signature_ok(self.headers, body):
            self.send_response(401)
            self.end_headers()
            return
        msg_id = self.headers["webhook-id"]
        if msg_id not in seen:  # a redelivery of an event already handled
            event = json.loads(body)
            print(f"{event['type']} of run {event['run']} (stage {event['stage']}): {event['data']}")
            seen.add(msg_id)
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    HTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 9000), Handler).serve_forever()
