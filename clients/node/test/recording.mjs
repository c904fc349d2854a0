// A test helper of client.test.mjs and otel.mjs.

import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

// A socket that answers every request allowed and keeps the requests it
// read, to see what the client sends.
export async function recordingServer(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'qd'));
  const file = path.join(dir, 'recording.sock');
  const requests = [];
  const conns = [];
  const server = net.createServer((c) => {
    conns.push(c);
    let buf = '';
    c.on('data', (chunk) => {
      buf += chunk;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const req = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        requests.push(req);
        c.write(JSON.stringify({ id: req.id, ok: true, allowed: true, replay: false, limit: 1, used: 1, remaining: 0, reset_ms: 1, retry_after_ms: 0 }) + '\n');
      }
    });
  });
  await new Promise((resolve) => server.listen(file, resolve));
  t.after(async () => {
    for (const c of conns) c.destroy();
    await new Promise((resolve) => server.close(resolve));
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { file, requests };
}
