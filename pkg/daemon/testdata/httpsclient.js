// Node's fetch in the interception tests (it trusts NODE_EXTRA_CA_CERTS).
//   node httpsclient.js METHOD URL [BODY [HEADER-VALUE]]
const [method, url, body, hdr] = process.argv.slice(2);
const headers = hdr ? { "X-Data": hdr } : {};
fetch(url, { method, body: body || undefined, headers })
  .then(async (r) => console.log(r.status, (await r.text()).replace(/\n/g, " ").slice(0, 300)))
  .catch((e) => console.log("error", e.cause ? e.cause.code || e.cause.message : e.message));
