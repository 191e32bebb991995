// A static file server for the demo page and the browser test (the js/
// folder, as `python -m http.server -d js` serves it), with the MIME types
// onnxruntime-web needs (application/wasm for its module).
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { JS_ROOT } from './artifacts.js';

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript',
  '.json': 'application/json', '.wasm': 'application/wasm', '.onnx': 'application/octet-stream',
  '.bin': 'application/octet-stream', '.map': 'application/json',
};

/**
 * Serves `root` on 127.0.0.1.
 * @param {number} [port=0] 0: any free port
 * @param {string} [root=JS_ROOT]
 * @returns {Promise<{server: http.Server, url: string}>}
 */
export function serve(port = 0, root = JS_ROOT) {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    const file = path.join(root, decodeURIComponent(url.pathname));
    if (!file.startsWith(root + path.sep)) {
      res.writeHead(403).end();
      return;
    }
    fs.readFile(file, (err, body) => {
      if (err) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'Content-Type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
      res.end(body);
    });
  });
  return new Promise((resolve) => {
    server.listen(port, '127.0.0.1', () => resolve({ server, url: `http://127.0.0.1:${server.address().port}` }));
  });
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.join(JS_ROOT, 'scripts', 'serve.js')) {
  const { url } = await serve(Number(process.argv[2] ?? 8000));
  console.log(`demo: ${url}/demo/`);
}
