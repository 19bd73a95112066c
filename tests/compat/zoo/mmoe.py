# A multi-task script with experts and gates, written the way DeepRec's model zoo writes mmoe, ple and
# simple_multitask (modelzoo/{mmoe,ple,simple_multitask}/train.py), for what those real scripts do that esmm.py
# does not: the Taobao CSV read with `price` as an int (an identity column, not a hashed string), the two labels
# kept as two columns ([batch, 2], one logit per task, sigmoid cross-entropy over both), the dataset yielding
# (labels, features) with the labels first (simple_multitask), input_layer(cols_to_output_tensors=...),
# tf.layers.dense named '<scope>/dense' inside AUTO_REUSE scopes, batch normalization in training mode in the
# experts (ple: its moving averages are in UPDATE_OPS and the checkpoint), softmax gates per task, and
# tf.keras.layers.Lambda for the gated sum (ple). Sizes are small so a test runs it in seconds.
# The lines a DeepRec user changes: the import below, and the one line of check_DeepRec_features()
# (docs/porting-deeprec.md, "The multi-task scripts' guard").

import argparse
import collections
import math
import os

from smartstage.compat import tf  # DeepRec: import tensorflow as tf
from tensorflow.python.ops import partitioned_variables

LABEL_COLUMNS = ['clk', 'buy']
HASH_INPUTS = ['pid', 'adgroup_id', 'cate_id', 'campaign_id', 'customer', 'brand', 'user_id', 'cms_segid',
               'cms_group_id', 'final_gender_code', 'age_level', 'pvalue_level', 'shopping_level', 'occupation',
               'new_user_class_level', 'tag_category_list', 'tag_brand_list']
IDENTITY_INPUTS = ['price']
NOT_USED_CATEGORY = ['final_gender_code']
TAG_COLUMN = ['tag_category_list', 'tag_brand_list']
HASH_BUCKET_SIZE = 200
PRICE_BUCKETS = 50
EMBEDDING_DIM = 8
EXPERTS_COUNT = 3
EXPERT_HIDDEN_UNITS = [32, 16]
TOWERS = [("ctr", "clk", [16, 8]), ("cvr", "buy", [16, 8])]
DNN_ACTIVATION = tf.nn.relu

args = None  # the parsed flags, global as in the model zoo
RESULTS = {}  # what the test reads: training losses, eval ACC and AUC, the checkpoint directory


class MultiTask():
    def __init__(self, input, feature_column, num_experts, expert_hidden_units, towers, optimizer_type='adam',
                 learning_rate=0.01, bf16=False, stock_tf=None, use_bn=True, input_layer_partitioner=None,
                 dense_layer_partitioner=None):
        self._labels = input[0]
        self._feature = input[1]
        self._label = tf.stack([self._labels[name] for name in LABEL_COLUMNS], axis=1)
        self._feature_column = feature_column
        self._num_experts = num_experts
        self._expert_hidden_units = expert_hidden_units
        self._towers = towers
        self._learning_rate = learning_rate
        self.tf = stock_tf
        self._bf16 = False if self.tf else bf16
        self.use_bn = use_bn
        self.is_training = True
        self._optimizer_type = optimizer_type
        self._input_layer_partitioner = input_layer_partitioner
        self._dense_layer_partitioner = dense_layer_partitioner
        self._create_model()
        with tf.name_scope('head'):
            self._create_loss()
            self._create_optimizer()
            self._create_metrics()

    def _add_layer_summary(self, value, tag):
        tf.summary.scalar('%s/fraction_of_zero_values' % tag, tf.nn.zero_fraction(value))
        tf.summary.histogram('%s/activation' % tag, value)

    def _make_scope(self, name, bf16, part):
        if bf16:
            return tf.variable_scope(name, partitioner=part, reuse=tf.AUTO_REUSE).keep_weights(dtype=tf.float32)
        return tf.variable_scope(name, partitioner=part, reuse=tf.AUTO_REUSE)

    def _expert(self, net, i):
        with tf.variable_scope(f'expert_{i}'):
            for layer_id, num_hidden_units in enumerate(self._expert_hidden_units):
                with tf.variable_scope(f'expert_{i}_layer_{layer_id}', reuse=tf.AUTO_REUSE) as layer_scope:
                    net = tf.layers.dense(net, units=num_hidden_units, activation=None,
                                          name=f'{layer_scope.name}/dense')
                    if self.use_bn:
                        net = tf.layers.batch_normalization(net, training=self.is_training, trainable=True)
                    net = DNN_ACTIVATION(net, name=f'{layer_scope.name}/act')
                    self._add_layer_summary(net, layer_scope.name)
        return net

    def _create_model(self):
        for key in TAG_COLUMN:
            self._feature[key] = tf.strings.split(self._feature[key], '|')
        key_dict = {}
        with self._make_scope('input_layer', self._bf16, self._input_layer_partitioner):
            input_emb = tf.feature_column.input_layer(self._feature, self._feature_column,
                                                      cols_to_output_tensors=key_dict)
        with self._make_scope('MultiTask', self._bf16, self._dense_layer_partitioner):
            experts = [self._expert(input_emb, i) for i in range(1, self._num_experts + 1)]
            experts_features = tf.keras.layers.Lambda(lambda x: tf.stack(x, axis=1))(experts)
            towers = []
            for tower_name, _, hidden_units in self._towers:
                with tf.variable_scope(f'{tower_name}_gate', reuse=tf.AUTO_REUSE):
                    gate = tf.layers.dense(input_emb, units=self._num_experts, name=f'{tower_name}_gate')
                    gate = tf.expand_dims(tf.nn.softmax(gate, axis=1), -1)
                with tf.variable_scope(tower_name):
                    tower_features = tf.keras.layers.Lambda(
                        lambda x: tf.math.reduce_sum(x[0] * x[1], axis=1, keep_dims=False),
                        name=f'{tower_name}_gate_mul_expert')([experts_features, gate])
                    for layer_id, num_hidden_units in enumerate(hidden_units):
                        with tf.variable_scope(f'{tower_name}_layer_{layer_id}',
                                               reuse=tf.AUTO_REUSE) as layer_scope:
                            tower_features = tf.layers.dense(tower_features, units=num_hidden_units,
                                                             name=f'{layer_scope.name}/dense')
                            tower_features = DNN_ACTIVATION(tower_features, name=f'{layer_scope.name}/act')
                    towers.append(tf.layers.dense(tower_features, units=1, activation=None,
                                                  name=f'{tower_name}_output'))
            self._logits = tf.squeeze(tf.stack(towers, axis=1), [2])
            self.probability = tf.math.sigmoid(self._logits)
            self.output = tf.round(self.probability)

    def _create_loss(self):
        self._logits = tf.squeeze(self._logits)
        self.loss = tf.losses.sigmoid_cross_entropy(self._label, self._logits, scope='loss',
                                                    reduction=tf.losses.Reduction.SUM_OVER_BATCH_SIZE)
        tf.summary.scalar('loss', self.loss)

    def _create_optimizer(self):
        self.global_step = tf.train.get_or_create_global_step()
        if self.tf or self._optimizer_type == 'adam':
            optimizer = tf.train.AdamOptimizer(learning_rate=self._learning_rate, beta1=0.9, beta2=0.999,
                                               epsilon=1e-8)
        elif self._optimizer_type == 'adagrad':
            optimizer = tf.train.AdagradOptimizer(learning_rate=self._learning_rate, initial_accumulator_value=0.1)
        elif self._optimizer_type == 'adamasync':
            optimizer = tf.train.AdamAsyncOptimizer(learning_rate=self._learning_rate)
        else:
            raise ValueError("Optimizer type error.")
        update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)  # batch normalization's moving averages
        with tf.control_dependencies(update_ops):
            self.train_op = optimizer.minimize(self.loss, global_step=self.global_step)

    def _create_metrics(self):
        self.acc, self.acc_op = tf.metrics.accuracy(labels=self._label, predictions=self.output)
        self.auc, self.auc_op = tf.metrics.auc(labels=self._label, predictions=self.probability,
                                               num_thresholds=1000)
        tf.summary.scalar('eval_acc', self.acc)
        tf.summary.scalar('eval_auc', self.auc)


def build_model_input(filename, batch_size, num_epochs):
    def parse_csv(value):
        hash_defaults = [[" "] for _ in HASH_INPUTS]
        label_defaults = [[0] for _ in LABEL_COLUMNS]
        identity_defaults = [[0] for _ in IDENTITY_INPUTS]
        columns = tf.io.decode_csv(value, record_defaults=label_defaults + hash_defaults + identity_defaults)
        named = list(zip(LABEL_COLUMNS + HASH_INPUTS + IDENTITY_INPUTS, columns))
        # labels first, as simple_multitask's parse_csv returns them
        return collections.OrderedDict(named[:2]), collections.OrderedDict(named[2:])

    if args.workqueue and not args.tf:
        from tensorflow.python.ops.work_queue import WorkQueue
        files = WorkQueue([filename], num_epochs=num_epochs).input_dataset()
    else:
        files = filename
    if args.parquet_dataset and not args.tf:
        from tensorflow.python.data.experimental.ops import parquet_dataset_ops
        dataset = parquet_dataset_ops.ParquetDataset(files, batch_size=batch_size)
    else:
        dataset = tf.data.TextLineDataset(files)
        dataset = dataset.shuffle(buffer_size=400000, seed=args.seed)
        dataset = dataset.repeat(num_epochs)
        dataset = dataset.batch(batch_size)
        dataset = dataset.map(parse_csv, num_parallel_calls=28)
    return dataset.prefetch(2)


def build_feature_cols():
    feature_cols = []
    for column_name in HASH_INPUTS + IDENTITY_INPUTS:
        if column_name in NOT_USED_CATEGORY:
            continue
        if column_name in HASH_INPUTS:
            column = tf.feature_column.categorical_column_with_hash_bucket(
                column_name, hash_bucket_size=HASH_BUCKET_SIZE, dtype=tf.string)
            if not args.tf and args.ev:
                ev_opt = tf.EmbeddingVariableOption(evict_option=None, filter_option=None)
                column = tf.feature_column.categorical_column_with_embedding(column_name, dtype=tf.string,
                                                                             ev_option=ev_opt)
        else:
            column = tf.feature_column.categorical_column_with_identity(column_name, PRICE_BUCKETS)
        if args.tf or not args.emb_fusion:
            embedding_column = tf.feature_column.embedding_column(column, dimension=EMBEDDING_DIM, combiner='mean')
        else:
            '''Embedding Fusion Feature'''
            embedding_column = tf.feature_column.embedding_column(column, dimension=EMBEDDING_DIM, combiner='mean',
                                                                  do_fusion=args.emb_fusion)
        feature_cols.append(embedding_column)
    return feature_cols


def train(sess_config, input_hooks, model, data_init_op, steps, checkpoint_dir):
    hooks = list(input_hooks)
    scaffold = tf.train.Scaffold(local_init_op=tf.group(tf.local_variables_initializer(), data_init_op),
                                 saver=tf.train.Saver(max_to_keep=args.keep_checkpoint_max))
    hooks.append(tf.train.StopAtStepHook(last_step=steps))
    hooks.append(tf.train.LoggingTensorHook({'steps': model.global_step, 'loss': model.loss}, every_n_iter=100))
    save_steps = args.save_steps if args.save_steps or args.no_eval else steps
    losses = RESULTS.setdefault('losses', [])
    with tf.train.MonitoredTrainingSession(
            master='', is_chief=True, hooks=hooks, scaffold=scaffold, checkpoint_dir=checkpoint_dir,
            save_checkpoint_steps=save_steps, summary_dir=checkpoint_dir, save_summaries_steps=args.save_steps,
            config=sess_config) as sess:
        while not sess.should_stop():
            loss, _ = sess.run([model.loss, model.train_op])
            losses.append(loss)
    print("Training completed.")


def eval(sess_config, input_hooks, model, data_init_op, steps, checkpoint_dir):
    hooks = list(input_hooks)
    scaffold = tf.train.Scaffold(local_init_op=tf.group(tf.local_variables_initializer(), data_init_op))
    session_creator = tf.train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=checkpoint_dir,
                                                   config=sess_config)
    writer = tf.summary.FileWriter(os.path.join(checkpoint_dir, 'eval'))
    merged = tf.summary.merge_all()
    with tf.train.MonitoredSession(session_creator=session_creator, hooks=hooks) as sess:
        for _in in range(1, steps + 1):
            if _in != steps:
                sess.run([model.acc_op, model.auc_op])
            else:
                eval_acc, eval_auc, events = sess.run([model.acc_op, model.auc_op, merged])
                writer.add_summary(events, _in)
                print("ACC = {}\nAUC = {}".format(eval_acc, eval_auc))
                RESULTS.update(acc=eval_acc, auc=eval_auc)
    writer.close()


def main():
    train_file = args.data_location + '/taobao_train_data'
    test_file = args.data_location + '/taobao_test_data'
    no_of_training_examples = sum(1 for _ in open(train_file))
    no_of_test_examples = sum(1 for _ in open(test_file))
    batch_size = math.ceil(args.batch_size / args.micro_batch) if args.micro_batch and not args.tf \
        else args.batch_size
    no_of_epochs = math.ceil((float(batch_size) * args.steps) / no_of_training_examples)
    train_steps = args.steps
    test_steps = math.ceil(float(no_of_test_examples) / batch_size)

    tf.set_random_seed(args.seed)
    checkpoint_dir = args.checkpoint if args.checkpoint else os.path.join(args.output_dir, 'model_MultiTask')
    RESULTS['checkpoint_dir'] = checkpoint_dir

    train_dataset = build_model_input(train_file, batch_size, no_of_epochs)
    test_dataset = build_model_input(test_file, batch_size, 1)
    iterator = tf.data.Iterator.from_structure(tf.data.get_output_types(train_dataset),
                                               tf.data.get_output_shapes(test_dataset))
    next_element = iterator.get_next()
    train_init_op = iterator.make_initializer(train_dataset)
    test_init_op = iterator.make_initializer(test_dataset)

    feature_cols = build_feature_cols()
    input_layer_partitioner = partitioned_variables.min_max_variable_partitioner(
        max_partitions=0, min_slice_size=args.input_layer_partitioner << 20) if args.input_layer_partitioner else None
    dense_layer_partitioner = partitioned_variables.min_max_variable_partitioner(
        max_partitions=0, min_slice_size=args.dense_layer_partitioner << 10) if args.dense_layer_partitioner else None

    sess_config = tf.ConfigProto()
    sess_config.inter_op_parallelism_threads = args.inter
    sess_config.intra_op_parallelism_threads = args.intra
    hooks = []
    if args.smartstaged and not args.tf:
        '''Smart staged Feature'''
        next_element = tf.staged(next_element, num_threads=args.stage_threads, capacity=40)
        sess_config.graph_options.optimizer_options.do_smart_stage = True
        hooks.append(tf.make_prefetch_hook())
    if args.op_fusion and not args.tf:
        '''Auto Graph Fusion'''
        sess_config.graph_options.optimizer_options.do_op_fusion = True
    if args.micro_batch and not args.tf:
        '''Auto Mirco Batch'''
        sess_config.graph_options.optimizer_options.micro_batch_num = args.micro_batch

    model = MultiTask(input=next_element, feature_column=feature_cols, num_experts=EXPERTS_COUNT,
                      expert_hidden_units=EXPERT_HIDDEN_UNITS, towers=TOWERS, optimizer_type=args.optimizer,
                      learning_rate=args.learning_rate, bf16=args.bf16, stock_tf=args.tf,
                      input_layer_partitioner=input_layer_partitioner,
                      dense_layer_partitioner=dense_layer_partitioner)
    RESULTS['model'] = model
    train(sess_config, hooks, model, train_init_op, train_steps, checkpoint_dir)
    if not args.no_eval:
        eval(sess_config, hooks, model, test_init_op, test_steps, checkpoint_dir)


def boolean_string(string):
    low_string = string.lower()
    if low_string not in {'false', 'true'}:
        raise ValueError('Not a valid boolean string')
    return low_string == 'true'


def get_arg_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument('--data_location', default='./data')
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--batch_size', type=int, default=512)
    parser.add_argument('--output_dir', default='./result')
    parser.add_argument('--checkpoint')
    parser.add_argument('--learning_rate', type=float, default=0.01)
    parser.add_argument('--save_steps', type=int, default=0)
    parser.add_argument('--seed', type=int, default=2021)
    parser.add_argument('--keep_checkpoint_max', type=int, default=1)
    parser.add_argument('--bf16', action='store_true')
    parser.add_argument('--no_eval', action='store_true')
    parser.add_argument('--inter', type=int, default=0)
    parser.add_argument('--intra', type=int, default=0)
    parser.add_argument('--input_layer_partitioner', type=int, default=0)
    parser.add_argument('--dense_layer_partitioner', type=int, default=0)
    parser.add_argument('--optimizer', type=str, choices=['adam', 'adamasync', 'adagraddecay', 'adagrad'],
                        default='adamasync')
    parser.add_argument('--tf', action='store_true')
    parser.add_argument('--smartstaged', type=boolean_string, default=True)
    parser.add_argument('--stage_threads', type=int, default=4)  # the model zoo hard-codes num_threads=4
    parser.add_argument('--emb_fusion', type=boolean_string, default=True)
    parser.add_argument('--ev', type=boolean_string, default=False)
    parser.add_argument('--op_fusion', type=boolean_string, default=True)
    parser.add_argument('--micro_batch', type=int, default=0)
    parser.add_argument('--adaptive_emb', type=boolean_string, default=False)
    parser.add_argument('--dynamic_ev', type=boolean_string, default=False)
    parser.add_argument('--incremental_ckpt', type=int, default=0)
    parser.add_argument('--workqueue', type=boolean_string, default=False)
    parser.add_argument('--parquet_dataset', type=boolean_string, default=True)
    parser.add_argument('--group_embedding', type=str, choices=[None, 'localized', 'collective'], default=None)
    return parser


def set_env_for_DeepRec():
    os.environ['START_STATISTIC_STEP'] = '100'
    os.environ['STOP_STATISTIC_STEP'] = '110'
    os.environ['MALLOC_CONF'] = 'background_thread:true,metadata_thp:auto,dirty_decay_ms:20000,muzzy_decay_ms:20000'
    if args.group_embedding == "collective":
        tf.config.experimental.enable_distributed_strategy(strategy="collective")


def check_stock_tf():
    import pkg_resources
    detailed_version = pkg_resources.get_distribution('Tensorflow').version
    return not ('deeprec' in detailed_version)


def check_DeepRec_features():
    # As shipped: return args.smartstaged or args.emb_fusion or args.op_fusion or args.micro_batch or ...
    # Edited for stock TensorFlow + smartstage (docs/porting-deeprec.md).
    return args.micro_batch or args.bf16 or \
           args.ev or args.adaptive_emb or args.dynamic_ev or (args.optimizer == 'adamasync') or \
           args.incremental_ckpt  or args.workqueue or args.group_embedding


if __name__ == '__main__':
    parser = get_arg_parser()
    args = parser.parse_args()

    stock_tf = args.tf
    if not stock_tf and check_stock_tf() and check_DeepRec_features():
        raise ValueError('Stock Tensorflow does not support DeepRec features. '
                         'For Stock Tensorflow run the script with `--tf` argument.')

    if not args.tf:
        set_env_for_DeepRec()

    main()
