// Sends one multipart mail with nodemailer, as a Node.js app would: text, HTML, attachment.
// Usage: node send_mail.js '<json>' with host, port, from, to, subject, text, html and
// attachment {filename, contentType, base64}, and optionally auth {user, pass} and
// authMethod (PLAIN, LOGIN). Prints what the server accepted, as JSON.
"use strict";

const nodemailer = require("nodemailer");

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const replies = [];
  const transport = nodemailer.createTransport({
    host: spec.host,
    port: spec.port,
    secure: false,
    ignoreTLS: true,
    ...(spec.auth ? { auth: spec.auth, authMethod: spec.authMethod } : {}),
    // The server's replies, to tell whether it took the login (nodemailer sends without
    // one when the server offers no AUTH).
    debug: true,
    logger: {
      level() {},
      ...Object.fromEntries(
        ["trace", "debug", "info", "warn", "error", "fatal"].map((level) => [
          level,
          (meta, message) => {
            if (meta && meta.tnx === "server") replies.push(String(message));
          },
        ])
      ),
    },
  });
  const info = await transport.sendMail({
    from: spec.from,
    to: spec.to,
    subject: spec.subject,
    text: spec.text,
    html: spec.html,
    attachments: [
      {
        filename: spec.attachment.filename,
        contentType: spec.attachment.contentType,
        content: Buffer.from(spec.attachment.base64, "base64"),
      },
    ],
  });
  const loggedIn = replies.some((reply) => reply.startsWith("235 "));
  process.stdout.write(
    JSON.stringify({ accepted: info.accepted, rejected: info.rejected, loggedIn }) + "\n"
  );
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
