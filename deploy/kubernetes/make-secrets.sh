#!/usr/bin/env bash
# The ring's Secrets for a cluster without cert-manager (overlays/cpu-no-operators, or any
# overlay with components/no-cert-manager): two CAs (one signs the ingresses, the other the
# workers), the ingresses' control and public certificates, the workers' client certificate.
# Prints them as Kubernetes Secrets; the CAs' keys stay in DIR (default: a new temporary
# folder, named on stderr), never in the cluster: keep them to issue certificates later.
#
#   ./deploy/kubernetes/make-secrets.sh NAMESPACE [DIR] | kubectl apply -f -
#
# Needs openssl. The names match base/certificates.yaml's secretNames.
set -euo pipefail
namespace="${1:?usage: $0 NAMESPACE [DIR]}"
dir="${2:-$(mktemp -d)}"
mkdir -p "$dir"
cd "$dir"
days=3650

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

ca() { # name, common name
    key "$1"
    openssl req -x509 -new -key "$1.key" -out "$1.crt" -days "$days" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

leaf() { # name, DNS name, extended key usage, CA
    key "$1"
    openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=$3" "subjectAltName=DNS:$2" "subjectKeyIdentifier=hash" \
        "authorityKeyIdentifier=keyid" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$4.crt" -CAkey "$4.key" -CAcreateserial \
        -out "$1.crt" -days "$days" -extfile "$1.ext" 2>/dev/null
}

secret() { # name, then key=file pairs
    local name="$1"
    shift
    printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' \
        "$name" "$namespace"
    printf 'type: Opaque\ndata:\n'
    for pair in "$@"; do
        printf '  %s: %s\n' "${pair%%=*}" "$(base64 -w0 < "${pair#*=}")"
    done
}

ca ingress-ca "llmtrio ingress CA"
ca worker-ca "llmtrio worker CA"
leaf control llmtrio-control serverAuth ingress-ca
leaf public llmtrio serverAuth ingress-ca
leaf worker llmtrio-worker clientAuth worker-ca

secret llmtrio-ingress-ca tls.crt=ingress-ca.crt
secret llmtrio-worker-ca tls.crt=worker-ca.crt
secret llmtrio-control-tls tls.crt=control.crt tls.key=control.key ca.crt=ingress-ca.crt
secret llmtrio-public-tls tls.crt=public.crt tls.key=public.key ca.crt=ingress-ca.crt
secret llmtrio-worker-tls tls.crt=worker.crt tls.key=worker.key ca.crt=worker-ca.crt
echo "the CAs and their keys are in $dir" >&2
