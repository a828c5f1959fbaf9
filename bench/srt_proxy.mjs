// The HTTP proxy of Anthropic's sandbox runtime (@anthropic-ai/sandbox-runtime), started on its
// own for bench/egress.py: `node bench/srt_proxy.mjs PACKAGE_DIR NAME`. It allows NAME only,
// resolves every name to 127.0.0.1 (the bench's origin), listens on 127.0.0.1 and prints
// {"port": N} once it listens. Not part of boxd.
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [packageDir, allowed] = process.argv.slice(2);
const module = join(packageDir, "dist", "sandbox", "http-proxy.js");
const { createHttpProxyServer } = await import(pathToFileURL(module).href);

// The bench's resolver: its one name is the origin on 127.0.0.1, as in boxd's bench egress.
const lookup = (hostname, options, callback) => {
  if (options && options.all) callback(null, [{ address: "127.0.0.1", family: 4 }]);
  else callback(null, "127.0.0.1", 4);
};

const server = createHttpProxyServer({
  filter: (port, host) => host === allowed,
  lookupFor: () => lookup,
});
server.listen(0, "127.0.0.1", () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
