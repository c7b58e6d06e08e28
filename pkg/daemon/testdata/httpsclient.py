# The Python clients of the interception tests: urllib and requests, each
# trusting only what the sandbox gives it. One line: status and body start.
#   python3 httpsclient.py urllib|requests METHOD URL [BODY [HEADER-VALUE]]
import sys

mode, method, url = sys.argv[1:4]
body = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
hdr = sys.argv[5] if len(sys.argv) > 5 else None
headers = {"X-Data": hdr} if hdr else {}
try:
    if mode == "urllib":
        import urllib.error
        import urllib.request
        req = urllib.request.Request(url, data=body.encode() if body else None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                code, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            code, text = e.code, e.read()
    else:
        import requests
        r = requests.request(method, url, data=body, headers=headers, timeout=20)
        code, text = r.status_code, r.content
    print(code, text.decode(errors="replace").replace("\n", " ")[:300])
except Exception as e:
    print("error", type(e).__name__, str(e).replace("\n", " ")[:300])
