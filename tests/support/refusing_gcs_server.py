"""A server that refuses every request as GCS refuses one (401, 403), and the one-line messages
the refusals must give."""

import http.server
import json


class RefusingServer(http.server.BaseHTTPRequestHandler):
  """Answers every request as GCS answers one it refuses: the status and GCS's JSON error."""
  status, message = 401, ''

  def _refuse(self):
    body = json.dumps({'error': {'code': self.status, 'message': self.message,
                                 'errors': [{'message': self.message, 'domain': 'global',
                                             'reason': 'required'}]}}).encode()
    self.send_response(self.status)
    self.send_header('Content-Type', 'application/json; charset=UTF-8')
    self.send_header('Content-Length', str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  do_GET = do_POST = do_PUT = _refuse

  def log_message(self, *args):
    del args


# GCS's own messages: a caller with no credentials is anonymous (401); credentials of an
# account without a role on the bucket get 403.
REFUSALS = [
    (401, 'Anonymous caller does not have storage.objects.list access to the Google Cloud '
          'Storage bucket. Permission \'storage.objects.list\' denied on resource (or it may '
          'not exist).', r'--workdir: gs://private/run: no credentials for gs://private \('
          r'Anonymous caller .*\): on a TPU or GCE VM .* GOOGLE_APPLICATION_CREDENTIALS'),
    (403, 'runner@project.iam.gserviceaccount.com does not have storage.objects.list access '
          'to the Google Cloud Storage bucket.', r'--workdir: gs://private/run: no access to '
          r'bucket gs://private \(runner@project.* does not have storage.objects.list access'),
]
