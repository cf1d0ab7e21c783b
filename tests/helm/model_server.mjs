// The model's download source for chart_run_test.sh: an HTTPS server on 127.0.0.1 that serves
// the stand-in model's files (models/ced-brown-shared) at whatever path a fetch-model URL names
// them (s3 path-style /BUCKET/PREFIX/NAME, hf /ORG/REPO/resolve/REVISION/NAME, a plain folder
// /PATH/NAME), by the path's last part; anything else is 404. Each request is logged.
//
//   node model_server.mjs PORT CERT_DIR MODEL_DIR       (CERT_DIR holds tls.crt and tls.key)
import fs from "node:fs";
import https from "node:https";
import path from "node:path";

const [port, certDir, modelDir] = process.argv.slice(2);
const files = new Set(fs.readdirSync(modelDir));
const server = https.createServer({
  cert: fs.readFileSync(path.join(certDir, "tls.crt")),
  key: fs.readFileSync(path.join(certDir, "tls.key")),
}, (req, res) => {
  const name = decodeURIComponent(new URL(req.url, "https://x").pathname.split("/").pop());
  console.log(`${req.method} ${req.url} -> ${files.has(name) ? name : 404}`);
  if (req.method !== "GET" || !files.has(name)) {
    res.writeHead(404).end();
    return;
  }
  const file = path.join(modelDir, name);
  res.writeHead(200, { "Content-Length": fs.statSync(file).size });
  fs.createReadStream(file).pipe(res);
});
server.listen(Number(port), "127.0.0.1", () => console.log(`serving ${modelDir} on ${port}`));
